"""The engine: decoding an exported model folder with numpy and ONNX Runtime, never torch. One idea a module:

- ``manifest``: what a model folder holds, and reading it; ``model_config``: the model's architecture;
- ``tokenizer``: SentencePiece pieces and ids; ``contract``: the decoder step's inputs and outputs by name;
- ``search``: the searches of one source (greedy, beam, the length penalty), which end on eos, at their longest
  output, or by the stop rules they take; ``stops``: the stop rules (``StopRule``; ``RepetitionGuard``, the
  runaway-output guard);
- ``caches``: the self-attention cache and its pool, on the host; ``source_cache``: the sources' cross-attention
  keys and values, on the host; ``held_copies``: a cache slot's copy made with the interpreter lock held;
- ``device_cache``: the self-attention cache on the step's device, moved by one-node graphs there;
- ``batch``: the running batch (``DecodeBatch``: add / step / remove, and ``drain``, the one fill-and-drain
  loop; the searches' loop), each step's inputs as a value (``StepInputs``), and its pluggable row layout
  (``RowLayout``); ``layout``: where a compact batch's rows sit in a step; ``greedy_rows``: a batch's greedy
  bookkeeping over numpy (eos, length and the stop rules' cheap tests for every row at once);
- ``compact_rows``: a batch's rows packed (``CompactRows``), gaps filled by sources from the end;
- ``slotted_rows``: a batch's rows in fixed-capacity buffers (``SlottedRows``): sources join and leave without
  moving others, and the step's inputs keep their memory and shape, as a captured CUDA step needs;
  ``bucket_buffers``: where a bucket's caches live (the host, or the step's device, kept per bucket shape);
  ``captured``: a bucket's step on a device (``DeviceSteps``), owning the device buffers it binds, bound once and
  replayed as one CUDA graph per bucket;
- ``binding``: a decoder step bound by reference and run in place, and the bindings a session keeps per batch;
- ``step_graphs``: the graphs made at load time from the loaded step (several greedy steps per run, the step
  split for capture, a device's greedy step, the beam reorder on a device), in one place; ``fusions``: fusions
  written into a step graph with ONNX Runtime's contrib operators (SkipLayerNormalization);
- ``options``: the engine's settings (``EngineSettings``, ``RuntimeOptions``); ``providers``: ONNX Runtime's
  execution providers and how a graph's session is opened on one;
- ``plan``: every choice the backend acts on, resolved once and checked together (``EnginePlan``);
- ``backend``: an exported folder on ONNX Runtime sessions (``OrtBackend``): encode, step, new batches;
- ``aligner``: where each output token looked in its source, to place markup;
- ``memory``: what a decoding sentence holds (``MemoryModel``) and the process's memory tuning;
- ``offline``: sources and texts translated to completion in batches;
- ``engine``: the model as a server decodes with it (``Engine``);
- ``cpu``: the CPU's name and features, and whether its int8 products saturate;
- ``translate_file``: the offline command-line translator.

``export/`` builds the graphs this package runs; ``model/`` is the PyTorch model and its training.
"""
