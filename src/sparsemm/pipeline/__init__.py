"""What the front ends run: each function returns a report the CLI prints and the web app
uses (``index`` and ``serve`` call one; ``up`` and ``search`` a few, see
docs/architecture.md).

* :mod:`sparsemm.pipeline.up` - a folder of photos to an indexed collection (:func:`up`).
* :mod:`sparsemm.pipeline.index` - a collection coded by a model into its index, and into
  Qdrant (:func:`index`).
* :mod:`sparsemm.pipeline.serve` - the search page and API under uvicorn (:func:`serve`).
* :mod:`sparsemm.pipeline.running` - the record of running servers, so that a search on a
  served collection is answered by its server.

Nothing is imported here: ``sparsemm --help`` stays fast.
"""
