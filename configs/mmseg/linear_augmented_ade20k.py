# DINOv2's linear head on ADE20K, trained with DINOv2's augmentation: eval.dense_mmseg_config=linear_augmented with
# data=ade20k. An example of a config of yours: it builds on the package's linear_ade20k.py (found by name in the
# config folders) and replaces its training pipeline; copy it, rename it and change what you need.
_base_ = ["./linear_ade20k.py"]
train_dataloader = dict(dataset=dict(pipeline=[
    dict(type="LoadImageFromFile", imdecode_backend="pillow"),
    dict(type="LoadAnnotations"),
    # the image rescaled to 0.5-2 x (4 size, size), a size x size crop at most 75% one class, a flip, colour jitter
    dict(type="RandomResize", scale=(4 * size, size), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type="RandomCrop", crop_size=(size, size), cat_max_ratio=0.75),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PhotoMetricDistortion"),
    dict(type="PackSegInputs"),
]))
