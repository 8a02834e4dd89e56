package memory

// MethodXLADevice labels peaks read from the device itself: the PJRT allocator's peak bytes in use
// (XLADeviceStats), with the CUDA plugin's preallocation off.
const MethodXLADevice Method = "measured: XLA device peak bytes in use (PJRT device memory stats, preallocation off)"

// DeviceStats is what an XLA device reports about its memory (PJRT_Device_MemoryStats).
type DeviceStats struct {
	// InUse is the bytes allocated now.
	InUse int64 `json:"bytes_in_use"`
	// Peak is the most bytes allocated at once since the client started (-1: not reported).
	Peak int64 `json:"peak_bytes_in_use"`
	// Limit is the bytes the allocator may hand out (-1: not reported).
	Limit int64 `json:"bytes_limit"`
}
