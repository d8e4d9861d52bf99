"""Items and collections: reading data sources, embedding them, keeping them on disk.

* :mod:`sparsemm.data.sources` - readers from folders, JSONL/CSV and COCO captions to item dicts.
* :mod:`sparsemm.data.collection` - a collection folder: dense embeddings plus item metadata.
* :mod:`sparsemm.data.encode` and :mod:`sparsemm.data.sync` - embedding items into a
  collection, and adding only new or changed photos on a re-run.
"""
