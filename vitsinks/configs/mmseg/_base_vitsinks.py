# Runtime settings shared by the vitsinks mmsegmentation configs (mmengine Python configs). Needs `vitsinks[mmseg]`
# and an mmcv with compiled ops; custom_imports registers VitsinksBackbone (vitsinks.probes.mmseg_adapter).
custom_imports = dict(imports=["vitsinks.probes.mmseg_adapter"], allow_failed_imports=False)
default_scope = "mmseg"
data_preprocessor = dict(type="SegDataPreProcessor", mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                         bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(512, 512))
optim_wrapper = dict(type="OptimWrapper", optimizer=dict(type="AdamW", lr=1e-3, weight_decay=1e-4))
param_scheduler = [dict(type="PolyLR", power=1.0, begin=0, end=40000, eta_min=0.0, by_epoch=False)]
train_cfg = dict(type="IterBasedTrainLoop", max_iters=40000, val_interval=4000)
val_cfg = dict(type="ValLoop")
test_cfg = dict(type="TestLoop")
val_evaluator = dict(type="IoUMetric", iou_metrics=["mIoU"])
test_evaluator = val_evaluator
