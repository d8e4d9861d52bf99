"""HTTP API and search page over an indexed collection: :func:`sparsemm.web.app.create_app`.

* :mod:`sparsemm.web.app` - the FastAPI app: routes, error handling, the page's files.
* :mod:`sparsemm.web.schemas` - request and response models and the bounds they enforce.
* :mod:`sparsemm.web.service` - the search service: concurrent search lanes, a bounded
  queue, re-index pick-up, explanations, cache memory bounds.
* :mod:`sparsemm.web.images` - item images, thumbnails, decoded uploads.
* :mod:`sparsemm.web.middleware` and :mod:`sparsemm.web.protocol` - Host checks, security
  headers, body caps; the guarded HTTP/1.1 protocol (head deadlines, connection cap).

Needs the ``web`` extra (FastAPI, uvicorn); ``sparsemm serve COLLECTION`` runs it.
"""
