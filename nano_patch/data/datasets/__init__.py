"""The dataset adapters: the batch routes of torchvision's and timm's datasets, and a user's own dataset's lazy
samples.
"""
