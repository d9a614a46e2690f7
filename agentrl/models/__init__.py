"""Model building: the tiny tool-calling model (``make-model``), its SFT warm start, SmolLM2 from GGUF."""
