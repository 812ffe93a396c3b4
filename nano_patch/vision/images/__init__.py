"""The images: JPEG decoding under PIL's guards, the patch's PIL image, a dataset's file index, a sample's pixel
source and the decoded-image cache (``cache/``)."""
