# DINOv2's linear head, the default config, on ADE20K: eval.dense_mmseg_config=linear with data=ade20k.
_base_ = ["./_linear.py", "./_ade20k.py"]
