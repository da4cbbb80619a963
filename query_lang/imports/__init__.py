"""Bring rules written for other tools into Vigil: Sigma rules (:mod:`query_lang.imports.sigma`,
through a pySigma backend) and Elastic's EQL (:mod:`query_lang.imports.eql`)."""
