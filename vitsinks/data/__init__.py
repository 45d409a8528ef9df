"""Datasets: the procedural `synthetic` default, offline `fashion_mnist`, and ImageFolder `imagenet`."""

from vitsinks.data import builtin  # noqa: F401 - registers the shipped data sets
from vitsinks.data.classification import check_root, num_classes
from vitsinks.data.datasets import DATASETS, build_dataset
from vitsinks.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from vitsinks.data.fashion_mnist import FashionMNIST
from vitsinks.data.imagefolder import BadImage, ImageFolderSplit, read_item
from vitsinks.data.sinktasks import SinkTask, is_sink_task
from vitsinks.data.synthetic_images import SyntheticShapes

__all__ = ["DATASETS", "FASHION_MNIST_ROOT", "BadImage", "FashionMNIST", "ImageFolderSplit", "SinkTask",
           "SyntheticShapes", "build_dataset", "check_root", "is_sink_task", "num_classes", "read_item"]
