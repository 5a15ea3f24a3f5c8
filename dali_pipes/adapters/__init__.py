"""adapters/: DaliLoader where a framework expects a DataLoader: Lightning (lightning.py, lightning_trainer.py),
Hugging Face Accelerate and Trainer (frameworks.py), torchdata.nodes (nodes.py). Above the loader; each imports
its framework only when used. Users import them by their public paths: dali_pipes.lightning, dali_pipes.frameworks,
dali_pipes.nodes."""
