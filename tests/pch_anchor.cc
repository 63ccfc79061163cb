// Anchors the precompiled header the test executables reuse (see CMakeLists.txt).
