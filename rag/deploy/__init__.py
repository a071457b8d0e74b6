"""Deployment tooling, off the request path: the memory planner (`planner`, `gpus`, `model_shapes`), the
llama-server profiles, the model lock (`rag models`) and `rag up`'s launcher. May import only `rag.core`."""
