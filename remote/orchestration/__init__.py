"""What runs stages in order, itself as a supervised job: `runner` (``inv run``'s pipeline)
and `chunked` (the chunked route: extract a chunk, train on it, delete it)."""
