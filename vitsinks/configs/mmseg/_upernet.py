# UperNet over the frozen model (mmseg's MultiLevelNeck + UPerHead): four blocks at a quarter, half, three quarters
# and the end of the depth, rescaled to a feature pyramid (4x, 2x, 1x, 0.5x the patch grid).
_base_ = ["./_runtime.py"]
model = dict(
    backbone=dict(out_indices=(depth // 4 - 1, depth // 2 - 1, 3 * depth // 4 - 1, depth - 1)),
    neck=dict(type="MultiLevelNeck", in_channels=[width] * 4, out_channels=width, scales=[4, 2, 1, 0.5]),
    decode_head=dict(type="UPerHead", in_channels=[width] * 4, in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6),
                     channels=512, dropout_ratio=0.1, num_classes=classes, norm_cfg=dict(type="BN"),
                     align_corners=False,
                     loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0, avg_non_ignore=True)))
