//go:build xla

package memory

/*
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// memfit_memory_stats mirrors PJRT_Device_MemoryStats_Args of the PJRT C API (pjrt_c_api.h, as vendored by go-xla
// v0.4.1 and v0.4.13, both PJRT C API 0.104; TestDeviceStatsLayout checks it): the same members in the same
// order, so the same layout. struct_size is set to the offset of the last member plus its size, as
// PJRT_DEFINE_STRUCT_TRAITS does.
typedef struct {
	size_t struct_size;
	void* extension_start;
	void* device;
	int64_t bytes_in_use;
	int64_t peak_bytes_in_use;
	bool peak_bytes_in_use_is_set;
	int64_t num_allocs;
	bool num_allocs_is_set;
	int64_t largest_alloc_size;
	bool largest_alloc_size_is_set;
	int64_t bytes_limit;
	bool bytes_limit_is_set;
	int64_t bytes_reserved;
	bool bytes_reserved_is_set;
	int64_t peak_bytes_reserved;
	bool peak_bytes_reserved_is_set;
	int64_t bytes_reservable_limit;
	bool bytes_reservable_limit_is_set;
	int64_t largest_free_block_bytes;
	bool largest_free_block_bytes_is_set;
	int64_t pool_bytes;
	bool pool_bytes_is_set;
	int64_t peak_pool_bytes;
	bool peak_pool_bytes_is_set;
} memfit_memory_stats;

typedef struct {
	size_t struct_size;
	void* extension_start;
	void* error;
} memfit_error_destroy;

// go-xla's cgo package defines these wrappers (gen_api_calls.c), which call the plugin's function table; they are
// linked into every binary built with the xla tag.
extern void* call_PJRT_Device_MemoryStats(const void* api, void* args);
extern void call_PJRT_Error_Destroy(const void* api, void* args);

static int memfit_device_memory_stats(const void* api, void* device, memfit_memory_stats* out) {
	memset(out, 0, sizeof(*out));
	out->struct_size = offsetof(memfit_memory_stats, peak_pool_bytes_is_set) + sizeof(bool);
	out->device = device;
	void* err = call_PJRT_Device_MemoryStats(api, out);
	if (err != NULL) {
		memfit_error_destroy d;
		d.struct_size = offsetof(memfit_error_destroy, error) + sizeof(void*);
		d.extension_start = NULL;
		d.error = err;
		call_PJRT_Error_Destroy(api, &d);
		return 1;
	}
	return 0;
}
*/
import "C"

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/go-xla/compute/xla"
	"github.com/gomlx/go-xla/pjrt"
)

// XLADeviceStats returns the memory statistics of the XLA backend's device (PJRT_Device_MemoryStats; go-xla
// v0.4.13 still has no Go wrapper for it, so memfit calls the plugin's function through go-xla's C wrapper). device is
// the addressable device's index (0 for one GPU). Peak is the device's peak bytes in use since the client
// started, so a fresh process per measured configuration gives that configuration's peak; with the CUDA
// plugin's preallocation on (see engine.PreallocateEnv) the figures describe the allocator's pool, not the work.
func XLADeviceStats(backend compute.Backend, device int) (stats DeviceStats, err error) {
	xb, ok := backend.(*xla.Backend)
	if !ok {
		return DeviceStats{}, fmt.Errorf("memory: backend %s is not the XLA backend", backend.Name())
	}
	defer func() {
		if r := recover(); r != nil {
			stats, err = DeviceStats{}, fmt.Errorf("%w: reading go-xla's client and device: %v", ErrInternals, r)
		}
	}()
	cf, err := privateField(reflect.ValueOf(xb).Elem(), "client", reflect.TypeFor[*pjrt.Client]())
	if err != nil {
		return DeviceStats{}, err
	}
	client := cf.Interface().(*pjrt.Client)
	devices := client.AddressableDevices()
	if device < 0 || device >= len(devices) {
		return DeviceStats{}, fmt.Errorf("memory: device %d out of range (%d addressable devices)", device, len(devices))
	}
	dv := reflect.ValueOf(devices[device]).Elem()
	cdev, err := privateField(dv, "cDevice", nil)
	if err != nil {
		return DeviceStats{}, err
	}
	pf, err := privateField(dv, "plugin", reflect.TypeFor[*pjrt.Plugin]())
	if err != nil {
		return DeviceStats{}, err
	}
	api, err := privateField(pf.Elem(), "api", nil)
	if err != nil {
		return DeviceStats{}, err
	}
	if cdev.Kind() != reflect.Pointer || api.Kind() != reflect.Pointer || cdev.IsNil() || api.IsNil() {
		return DeviceStats{}, fmt.Errorf("%w: go-xla's device or API pointer is %s / %s", ErrInternals, cdev.Type(), api.Type())
	}
	var out C.memfit_memory_stats
	if C.memfit_device_memory_stats(api.UnsafePointer(), cdev.UnsafePointer(), &out) != 0 {
		return DeviceStats{}, fmt.Errorf("memory: the XLA plugin does not report device memory statistics")
	}
	stats = DeviceStats{InUse: int64(out.bytes_in_use), Peak: -1, Limit: -1}
	if out.peak_bytes_in_use_is_set {
		stats.Peak = int64(out.peak_bytes_in_use)
	}
	if out.bytes_limit_is_set {
		stats.Limit = int64(out.bytes_limit)
	}
	return stats, nil
}

// statsLayout returns the size and member offsets of memfit's mirror of PJRT_Device_MemoryStats_Args, for the
// test that checks them against the PJRT header go-xla vendors.
func statsLayout() map[string]uintptr {
	var s C.memfit_memory_stats
	return map[string]uintptr{
		"struct_size":              uintptr(unsafe.Offsetof(s.peak_pool_bytes_is_set)) + 1,
		"device":                   unsafe.Offsetof(s.device),
		"bytes_in_use":             unsafe.Offsetof(s.bytes_in_use),
		"peak_bytes_in_use":        unsafe.Offsetof(s.peak_bytes_in_use),
		"peak_bytes_in_use_is_set": unsafe.Offsetof(s.peak_bytes_in_use_is_set),
		"bytes_limit":              unsafe.Offsetof(s.bytes_limit),
		"bytes_limit_is_set":       unsafe.Offsetof(s.bytes_limit_is_set),
		"peak_pool_bytes_is_set":   unsafe.Offsetof(s.peak_pool_bytes_is_set),
	}
}
