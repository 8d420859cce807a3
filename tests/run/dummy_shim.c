/* Stands in for libvramscope.so in tests/run: `vramscope run` preloads it into the fake
 * application, which writes its ring itself through the ring writer. */
int vramscope_dummy_shim_loaded(void) { return 1; }
