"""One folder per op: ``kernels.py`` (Triton), ``plan.py`` (launch decisions as tables), ``op.py``
(launchers, custom ops, autograd and the public functions). The public functions are re-exported
by :mod:`onlinesoftmax`; this package's own namespace stays empty so that no function shadows a
folder."""
