"""The engine: decoding an exported model folder with numpy and ONNX Runtime, never torch.

- ``manifest``: what a model folder holds, and reading it;
- ``tokenizer``: SentencePiece pieces and ids;
- ``search``: the searches (greedy, beam, the runaway guard), the caches and the running batch (``DecodeBatch``:
  add / step / remove, and ``decode``, the one fill-and-drain loop);
- ``sessions``: an exported folder on ONNX Runtime sessions (``OrtModel``), the step's bindings, device caches;
- ``engine``: the model as a server decodes with it (``Engine``, ``RunningBatch``) and its memory model;
- ``cpu``: the CPU's name and features, and whether its int8 products saturate;
- ``translate_file``: the offline command-line translator.

``export/`` builds the graphs this package runs; ``model/`` is the PyTorch model and its training.
"""
