"""The broker protocol, sans-IO: frames, requests and answers, errors, replication calls."""
