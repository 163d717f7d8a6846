# ssdmoe-tui developer tasks.

# --- native expert reader (ssdmoe_tui/engine/_native) ---
NATIVE_DIR := ssdmoe_tui/engine/_native
NATIVE_EXT := $(if $(filter Darwin,$(shell uname -s)),dylib,so)
NATIVE_LIB := $(NATIVE_DIR)/libssdmoe_reader.$(NATIVE_EXT)
NATIVE_CC ?= $(or $(CC),cc)

.PHONY: native
native: $(NATIVE_LIB)

$(NATIVE_LIB): $(NATIVE_DIR)/ssdmoe_reader.c $(NATIVE_DIR)/ssdmoe_reader.h
	$(NATIVE_CC) -O2 -Wall -Wextra -shared -fPIC -pthread -o $@.tmp $(NATIVE_DIR)/ssdmoe_reader.c && mv -f $@.tmp $@
