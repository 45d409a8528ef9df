# UperNet over the frozen model, on Pascal VOC 2012: eval.dense_mmseg_config=upernet with data=voc.
_base_ = ["./_upernet.py", "./_voc.py"]
