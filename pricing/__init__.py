"""spotring pricing: spot prices, availability and revocation risk per offering.

Sources (AWS, GCP, recorded traces) produce :class:`pricing.model.PriceQuote` and
:class:`pricing.model.Availability` records; :mod:`pricing.sanity` rejects implausible ones;
:mod:`pricing.store` keeps the believable ones; :mod:`pricing.risk` turns observed lifetimes
into a revocation hazard per offering. Everything the optimiser reads comes from here.
"""
