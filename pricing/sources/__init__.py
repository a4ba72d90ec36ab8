"""Price sources: one file per implementation of :class:`pricing.sources.base.PriceSource`."""
