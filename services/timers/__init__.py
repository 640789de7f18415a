"""The timer service: absence (R10.2) and expiry (R10.3) deadlines, on time and durable."""
