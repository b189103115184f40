"""Every restart recovers (I9): what Spark's checkpoint planned (:mod:`.checkpoint`), the
checkpoint judged against the table before a run starts (:mod:`.verdict`), and the lease a
running pipeline holds so that operators' commands and other runs see it (:mod:`.lease`)."""
