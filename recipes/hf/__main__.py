from recipes.hf.cli import main

main()
