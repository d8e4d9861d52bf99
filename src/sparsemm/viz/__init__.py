"""Pictures and pages for people: word clouds of concept dimensions
(:mod:`sparsemm.viz.wordcloud`), the demo's HTML report and result-grid PNGs
(:mod:`sparsemm.viz.report`).

Nothing is imported here, so ``import sparsemm.viz`` stays cheap; import the submodules.
"""
