"""The batches layer: a DataLoader's plan (``loader_plan``) and every path it can take. The loader threads
(``fetch``, ``batch_loader`` and its stages), virtual workers (``virtual_workers`` and its streams and stand-ins),
worker processes (``workers``), uint8 batches and the tensor tail finished on the host (``uint8_batches``,
``finish_tail``), and the datasets' adapters that the dataset patches install."""
