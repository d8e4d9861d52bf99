"""HTTP API and search page over an indexed collection: :func:`sparsemm.web.app.create_app`.

Needs the ``web`` extra (FastAPI, uvicorn); ``sparsemm serve COLLECTION`` runs it.
"""
