"""draftgen: regenerate drafter training data with the target model on a fleet of SGLang servers."""

__version__ = "0.1.0"
