# UperNet on four blocks of a vitsinks ViT-B (fine-tuned), rescaled to a feature pyramid.
norm_cfg = dict(type="SyncBN", requires_grad=True)
model = dict(
    type="EncoderDecoder",
    backbone=dict(type="VitsinksBackbone", size="vit_base", out_indices=(3, 5, 7, 11), frozen=False, checkpoint=None),
    neck=dict(type="MultiLevelNeck", in_channels=[768] * 4, out_channels=768, scales=[4, 2, 1, 0.5]),
    decode_head=dict(type="UPerHead", in_channels=[768] * 4, in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6),
                     channels=512, dropout_ratio=0.1, num_classes=150, norm_cfg=norm_cfg, align_corners=False,
                     loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0)),
    test_cfg=dict(mode="slide", crop_size=(512, 512), stride=(341, 341)))
