"""Commands over the library: convert, verify, doctor, the `dali-pipes` CLI, the built-in sample dataset, the
static GPU graph check, worker pools. Nothing in the library below imports them."""
