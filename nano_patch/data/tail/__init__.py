"""The tensor tail: uint8 batches across processes, and the tail finished on the host or the device.
"""
