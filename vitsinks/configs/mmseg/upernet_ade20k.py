# UperNet over the frozen model, on ADE20K: eval.dense_mmseg_config=upernet with data=ade20k.
_base_ = ["./_upernet.py", "./_ade20k.py"]
