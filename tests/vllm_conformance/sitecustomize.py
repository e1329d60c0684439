"""Every Python started with the conformance run's PYTHONPATH (this directory first) imports the
fetched torchvision through torchvision_fix. vLLM inspects a model class in a child Python when
~/.cache/vllm/modelinfos has no entry for it yet (a new machine): without this, that child fails
to import torchvision, and every test building that model's config fails."""

try:
    from torchvision_fix import import_torchvision

    import_torchvision()
except Exception:  # never stop an interpreter from starting; the plugin reports what is unusable
    pass
