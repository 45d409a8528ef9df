# ADE20K (150 classes, reduce zero label) for mmsegmentation 1.x.
dataset_type = "ADE20KDataset"
data_root = "data/ade/ADEChallengeData2016"
crop_size = (512, 512)
train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="RandomResize", scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type="RandomCrop", crop_size=crop_size, cat_max_ratio=0.75),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PackSegInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="Resize", scale=(2048, 512), keep_ratio=True),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="PackSegInputs"),
]
train_dataloader = dict(
    batch_size=4, num_workers=4, sampler=dict(type="InfiniteSampler", shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path="images/training", seg_map_path="annotations/training")))
val_dataloader = dict(
    batch_size=1, num_workers=4, sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path="images/validation", seg_map_path="annotations/validation")))
test_dataloader = val_dataloader
