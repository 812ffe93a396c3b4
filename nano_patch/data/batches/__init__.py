"""A batch's stages: each sample's source and draws in stock's order (the draw), its pixels on the loader's threads
(the render), and the take; the drawn-apart path the virtual workers and the batches made ahead share.
"""
