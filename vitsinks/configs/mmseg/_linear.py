# DINOv2's linear head (BNHead): BatchNorm + 1x1 convolution over the last block's final-norm patch tokens, the
# logits upsampled bilinearly; cross-entropy averaged over the labelled pixels (255 ignored). init_cfg=None: the
# convolution starts as PyTorch draws it, as the native dinov2 protocol's does (DINOv2's own configs draw it from
# N(0, 0.01): init_cfg=dict(type="Normal", std=0.01, override=dict(name="conv_seg"))).
_base_ = ["./_runtime.py"]
model = dict(
    backbone=dict(out_indices=(-1,)),
    decode_head=dict(type="BNHead", in_channels=[width], in_index=[0], input_transform="resize_concat",
                     channels=width, dropout_ratio=0.0, num_classes=classes, norm_cfg=dict(type="BN"),
                     align_corners=False, init_cfg=None,
                     loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0, avg_non_ignore=True)))
