"""Evaluation: `rag eval` (`cli`) and its harness and report (`harness`). On top: may import everything."""
