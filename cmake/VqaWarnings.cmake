# Warnings and sanitizer flags for the project's own targets (not for LibTorch's).
add_library(vqa_warnings INTERFACE)
target_compile_options(vqa_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)

if(VQA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
