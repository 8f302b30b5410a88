"""Node producers: NVML collector, simulator and the one Kafka publisher."""
