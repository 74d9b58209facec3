# Writes OUT (a header with the git commit of SRC) only when it changes, so rebuilds stay
# incremental while events.jsonl always names the commit the binary was built from.
execute_process(COMMAND git -C "${SRC}" rev-parse HEAD OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(commit "unknown")
endif()
execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no OUTPUT_VARIABLE dirty
                ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(dirty)
  set(commit "${commit}-dirty")
endif()
set(content "#pragma once\n#define TOY_GIT_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
