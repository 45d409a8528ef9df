# DINOv2's linear head, the default config, on Pascal VOC 2012: eval.dense_mmseg_config=linear with data=voc.
_base_ = ["./_linear.py", "./_voc.py"]
