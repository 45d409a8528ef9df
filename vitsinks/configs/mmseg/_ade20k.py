# ADE20K in mmseg's ADE20KDataset: 150 classes, label 0 ("other") ignored and the rest shifted down by one
# (reduce-zero-label), under data_root = <data.root>/ADEChallengeData2016. Training images and labels resized to
# size x size (the native dinov2 protocol's inputs); val images with their short side at size (the long side at
# most 4 x size), labels at full resolution. Images decoded and resized with Pillow, as the native probe does (mmseg's
# default is OpenCV).
dataset_type = "ADE20KDataset"
train_pipeline = [
    dict(type="LoadImageFromFile", imdecode_backend="pillow"),
    dict(type="LoadAnnotations"),
    dict(type="Resize", scale=(size, size), keep_ratio=False, backend="pillow"),
    dict(type="PackSegInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile", imdecode_backend="pillow"),
    dict(type="Resize", scale=(4 * size, size), keep_ratio=True, backend="pillow"),
    dict(type="LoadAnnotations"),
    dict(type="PackSegInputs"),
]
train_dataloader = dict(
    batch_size=batch_size, num_workers=workers, sampler=dict(type="DefaultSampler", shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path="images/training", seg_map_path="annotations/training")))
val_dataloader = dict(
    batch_size=1, num_workers=workers, sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path="images/validation", seg_map_path="annotations/validation")))
