# Pascal VOC 2012 in mmseg's PascalVOCDataset: 21 classes (background included), 255 (object borders) ignored,
# under data_root = <data.root>/VOCdevkit/VOC2012; the splits are ImageSets/Segmentation/{train,val}.txt
# (data.voc_aug=true: the command trains on SegmentationClassAug with train_aug.txt). Sizes as for ADE20K.
dataset_type = "PascalVOCDataset"
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
                 ann_file="ImageSets/Segmentation/train.txt",
                 data_prefix=dict(img_path="JPEGImages", seg_map_path="SegmentationClass")))
val_dataloader = dict(
    batch_size=1, num_workers=workers, sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 ann_file="ImageSets/Segmentation/val.txt",
                 data_prefix=dict(img_path="JPEGImages", seg_map_path="SegmentationClass")))
