# DINOv2's multi-layer linear head: the final-norm patch tokens of the last four blocks, concatenated along channels
# (4 x width), then BatchNorm + 1x1 convolution (BNHead), initialised as in _linear.py. A model with fewer blocks
# repeats some.
_base_ = ["./_runtime.py"]
model = dict(
    backbone=dict(out_indices=(-4, -3, -2, -1)),
    decode_head=dict(type="BNHead", in_channels=[width] * 4, in_index=[0, 1, 2, 3], input_transform="resize_concat",
                     channels=4 * width, dropout_ratio=0.0, num_classes=classes, norm_cfg=dict(type="BN"),
                     align_corners=False, init_cfg=None,
                     loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0, avg_non_ignore=True)))
