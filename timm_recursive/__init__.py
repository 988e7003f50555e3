"""timm-recursive: recursive DSA-MoE classifiers and friends, registered as timm models.

``import timm_recursive`` registers every architecture with timm, after which
``timm.create_model('recursive_dsa_moe_cifar')`` and ``timm.list_models('recursive_*')`` work.
"""
from . import layers, models
from .models import RecursiveClassifier

__version__ = '0.1.0'

__all__ = ['layers', 'models', 'RecursiveClassifier', '__version__']
