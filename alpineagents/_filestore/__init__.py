"""FileStore's parts, one module each; the store and its rules: :mod:`alpineagents.filestore`."""
