# Linear head (BN + 1x1 conv) on the frozen last-block patch tokens of a vitsinks ViT-B.
norm_cfg = dict(type="SyncBN", requires_grad=True)
model = dict(
    type="EncoderDecoder",
    backbone=dict(type="VitsinksBackbone", size="vit_base", out_indices=(-1,), frozen=True, checkpoint=None),
    decode_head=dict(type="FCNHead", in_channels=768, in_index=0, channels=768, num_convs=0, concat_input=False,
                     dropout_ratio=0.0, num_classes=150, norm_cfg=norm_cfg, align_corners=False,
                     loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0)),
    test_cfg=dict(mode="slide", crop_size=(512, 512), stride=(341, 341)))
