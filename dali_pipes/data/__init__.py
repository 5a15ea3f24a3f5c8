"""What the bytes mean: a location resolved to shards, a Source of samples and labels (one file per format in
formats/), indexes, manifests, labels, fingerprints, and the DALI reader nodes of a Source with the one model
of what that reader does (reader.py). Uses storage/ below it."""
