# vitsinks ViT-B, linear head, ade20k. Set the checkpoint (a vitsinks training checkpoint) and run mmseg's trainer:
#   python tools/train.py vitsinks/configs/mmseg/vitsinks_linear_ade20k.py \
#     --cfg-options model.backbone.checkpoint=<last.pt>
_base_ = ["./_base_vitsinks.py", "./_ade20k.py", "./_linear.py"]
model = dict(data_preprocessor={{_base_.data_preprocessor}}, decode_head=dict(num_classes=150))
