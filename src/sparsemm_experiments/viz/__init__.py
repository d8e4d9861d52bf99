"""Pictures and pages for people: word clouds of concept dimensions
(:mod:`sparsemm_experiments.viz.wordcloud`), the demo's HTML report and result-grid PNGs
(:mod:`sparsemm_experiments.viz.report`).

Nothing is imported here, so ``import sparsemm_experiments.viz`` stays cheap; import the submodules.
"""
