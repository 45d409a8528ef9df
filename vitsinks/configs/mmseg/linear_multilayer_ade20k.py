# DINOv2's multi-layer linear head (last four blocks), on ADE20K:
# eval.dense_mmseg_config=linear_multilayer with data=ade20k.
_base_ = ["./_linear_multilayer.py", "./_ade20k.py"]
