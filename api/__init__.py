"""trainmem: predict the per-GPU memory of a training job before it runs."""
