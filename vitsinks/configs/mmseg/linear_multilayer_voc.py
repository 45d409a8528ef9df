# DINOv2's multi-layer linear head (last four blocks), on Pascal VOC 2012:
# eval.dense_mmseg_config=linear_multilayer with data=voc.
_base_ = ["./_linear_multilayer.py", "./_voc.py"]
