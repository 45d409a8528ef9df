# What every config of the mmseg dense backend shares (python -m vitsinks.eval.dense ... eval.dense_backend=mmseg;
# docs/evaluation.md). A config is read, never run: assignments of numbers, strings, lists, tuples and dict(...).
# The lower-case names no line assigns are the command's: size (input side: the model's, or eval.dense_size), width
# and depth (the model's), classes (the data's), data_root (data.root), workers (data.num_workers), and the dense
# protocol's epochs, lr, weight_decay and batch_size (eval.dense_protocol=dinov2 with the eval.dense_* overrides).
default_scope = "mmseg"
log_level = "INFO"
# the segmentor; the backbone is the command's frozen model (VitsinksBackbone), inputs ImageNet-normalised RGB
model = dict(
    type="EncoderDecoder",
    data_preprocessor=dict(type="SegDataPreProcessor", mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                           bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(size, size)),
    backbone=dict(type="VitsinksBackbone", out_indices=(-1,)),
    # inference: windows of size x size sliding with a stride of 2/3 of a window, logits averaged, then resized to
    # the label map's full resolution
    test_cfg=dict(mode="slide", crop_size=(size, size), stride=(size * 2 // 3, size * 2 // 3)))
# AdamW on the head (the frozen backbone has no gradients); a cosine from lr to 0, stepped every iteration
optim_wrapper = dict(type="OptimWrapper", optimizer=dict(type="AdamW", lr=lr, weight_decay=weight_decay))
param_scheduler = [dict(type="CosineAnnealingLR", T_max=epochs, eta_min=0.0, by_epoch=True,
                        convert_to_iter_based=True)]
# epochs over the training split (mmengine evaluates the val split after the last one, and every val_interval)
train_cfg = dict(type="EpochBasedTrainLoop", max_epochs=epochs, val_interval=epochs)
val_cfg = dict(type="ValLoop")
# mmseg's metric: per-class IoU over the whole val split (255 ignored), its table, mIoU over the classes present
val_evaluator = dict(type="IoUMetric", iou_metrics=["mIoU"])
default_hooks = dict(logger=dict(type="LoggerHook", interval=50), checkpoint=None)  # the command saves the head
