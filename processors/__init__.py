"""Stream processors (faust-streaming): validate, normalize and interpret GPU samples."""
